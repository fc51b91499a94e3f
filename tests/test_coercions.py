"""Nothing is coerced silently: a float offset, a non-integer size, a string for a
bool option, a NaN tolerance, a preset that would override a given field, complex features, features that
require grad, data on the meta device and ``lam=True`` all raise an error naming the parameter and the value,
instead of being truncated, cast or ignored."""
import math

import numpy as np
import pytest
import torch

from conftest import random_chain_problem, random_multiclass_problem
from torch_bcfw import MulticlassData, SequenceData, fit
from torch_bcfw.data import GraphData, PoseData, SparseFeatures
from torch_bcfw.models import Chain, Multiclass
from torch_bcfw.checks import check_lam
from torch_bcfw.models.graphcut import GraphCut
from torch_bcfw.models.pose import PoseTree
from torch_bcfw.nn import StructuredHead, structured_hinge
from torch_bcfw.solvers.bcfw_options import AUTO_CHOICES, PRESETS, auto_fits, auto_pending, variant_name
from torch_bcfw.solvers.options import SolverOptions
from torch_bcfw.solvers.mpbcfw import MPOptions
from torch_bcfw.solvers.run import ALGORITHMS, options_for

NAN, INF = math.nan, math.inf


def _seq(offsets, x=None):
    x = torch.randn(5, 2, dtype=torch.float64) if x is None else x
    return SequenceData(x, torch.zeros(5, dtype=torch.long), offsets)


def _graph(**over):
    kw = dict(x=torch.randn(4, 2, dtype=torch.float64), y=torch.tensor([0, 1, 1, 0]), offsets=torch.tensor([0, 4]),
              edges=torch.tensor([[0, 1], [1, 2], [2, 3]]), edge_x=torch.ones(3, 1, dtype=torch.float64),
              edge_offsets=torch.tensor([0, 3]))
    kw.update(over)
    return GraphData(kw["x"], kw["y"], kw["offsets"], kw["edges"], kw["edge_x"], kw["edge_offsets"])


def _pose(unary=None, **kw):
    unary = torch.randn(2, 3, 4, 4, dtype=torch.float64) if unary is None else unary
    return PoseData(unary, torch.zeros(unary.shape[0], 3, 2, dtype=torch.long), **kw)


# ---------------------------------------------------------------------- integer index tensors
@pytest.mark.parametrize("build, exc, fragment", [
    (lambda: _seq(torch.tensor([0.0, 2.0, 5.0])), ValueError, "SequenceData.offsets must hold integers, got torch.float32"),
    (lambda: _seq([0.0, 2.0, 5.0]), ValueError, "SequenceData.offsets must hold integers"),
    (lambda: _seq(torch.tensor([0.0, 2.5, 5.0], dtype=torch.float64)), ValueError, "values [0.0, 2.5, 5.0]"),
    (lambda: _seq(torch.tensor([True, True])), ValueError, "SequenceData.offsets must hold integers, got torch.bool"),
    (lambda: SequenceData.from_padded(torch.randn(2, 3, 4), torch.tensor([3.0, 2.0])), ValueError,
     "lengths must hold integers"),
    (lambda: _graph(offsets=torch.tensor([0.0, 4.0])), ValueError, "GraphData.offsets must hold integers"),
    (lambda: _graph(edges=torch.tensor([[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]])), ValueError,
     "GraphData.edges must hold integers"),
    (lambda: _graph(edge_offsets=torch.tensor([0.0, 3.0])), ValueError, "GraphData.edge_offsets must hold integers"),
    (lambda: GraphData.from_graphs([torch.randn(3, 2, dtype=torch.float64)], [torch.tensor([[0.0, 1.0]])],
                                   [torch.ones(1, 1, dtype=torch.float64)]), ValueError, "GraphData.edges must hold integers"),
    (lambda: structured_hinge(Chain(2, 3), torch.zeros(Chain(2, 3).n_features, dtype=torch.float64),
                              torch.randn(5, 2, dtype=torch.float64), torch.zeros(5, dtype=torch.long),
                              offsets=torch.tensor([0.0, 2.0, 5.0])), ValueError, "offsets must hold integers"),
    (lambda: StructuredHead(Chain(2, 3))(torch.randn(2, 3, 2, dtype=torch.float64), lengths=torch.tensor([3.0, 2.0])),
     ValueError, "lengths must hold integers"),
])
def test_float_index_tensors_are_rejected(build, exc, fragment):
    with pytest.raises(exc, match=fragment.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        build()


@pytest.mark.parametrize("idx", [[0.0, 1.0], torch.tensor([0.0, 1.0]), np.array([0.5]), torch.tensor([True, False, True])])
def test_float_or_bool_example_indices_are_rejected(idx):
    _, seq = random_chain_problem(n=3)
    _, mc = random_multiclass_problem(n=3)
    for data in (seq, mc, _pose(torch.randn(3, 3, 4, 4, dtype=torch.float64)), _graph()):
        with pytest.raises(TypeError, match="example indices must hold integers, got torch.(float|bool)|a bool tensor"):
            data[idx]


def test_integer_indices_and_offsets_still_work():
    x = torch.randn(5, 2, dtype=torch.float64)
    for off in ([0, 2, 5], torch.tensor([0, 2, 5], dtype=torch.int32), np.array([0, 2, 5])):
        assert _seq(off, x).offsets.dtype == torch.long
    _, seq = random_chain_problem(n=4)
    assert len(seq[[0, 2]]) == 2 and len(seq[np.array([1])]) == 1 and len(seq[3]) == 1
    assert len(_pose()[0:1]) == 1


# ---------------------------------------------------------------------- integer and bool parameters
@pytest.mark.parametrize("build, fragment", [
    (lambda: Chain(2.5, 3), "n_features must be an integer, got 2.5"),
    (lambda: Chain(4, 3.0), "n_labels must be an integer, got 3.0"),
    (lambda: Chain(True, 3), "n_features must be an integer, got True"),
    (lambda: Chain("4", 3), "n_features must be an integer, got '4'"),
    (lambda: Multiclass(3.0, 2), "n_features must be an integer, got 3.0"),
    (lambda: Multiclass(3, 2.5), "n_labels must be an integer, got 2.5"),
    (lambda: Multiclass(3, 2, bias="no"), "bias must be a bool"),
    (lambda: Multiclass(3, 2, bias=0), "bias must be a bool"),
    (lambda: GraphCut(2.5), "n_node_features must be an integer, got 2.5"),
    (lambda: GraphCut(3, 2.0), "n_edge_features must be an integer, got 2.0"),
    (lambda: GraphCut(3, pairwise="yes"), "pairwise must be a bool"),
    (lambda: GraphCut(3, processes=1.5), "processes must be an integer"),
    (lambda: PoseTree(8.0), "grid_size must be an integer, got 8.0"),
    (lambda: PoseTree(8, n_joints=3, n_unary=1.0, edges=[(0, 1), (1, 2)]), "n_unary must be an integer"),
    (lambda: PoseTree(8, n_joints=3, edges=[(0, 1), (1.0, 2)]), "edges .a parent joint. must be an integer, got 1.0"),
    (lambda: PoseTree(8, mu=torch.zeros(2, 2, 2), n_joints=3, edges=[(0, 1), (1, 2)], type_features="yes"),
     "type_features must be a bool"),
    (lambda: SparseFeatures(torch.tensor([0, 1]), torch.tensor([0]), None, 2.5), "SparseFeatures.n_features must be an integer"),
    (lambda: SparseFeatures(torch.tensor([0, 1]), torch.tensor([0]), None, 3.0), "SparseFeatures.n_features must be an integer"),
    (lambda: SequenceData.from_attribute_ids([torch.tensor([[0, 1]])], 4.0), "n_attributes must be an integer, got 4.0"),
])
def test_non_integer_sizes_and_non_bool_flags_raise_type_error(build, fragment):
    with pytest.raises(TypeError, match=fragment):
        build()


def test_numpy_integers_and_bools_are_accepted():
    m = Chain(np.int64(4), np.int32(3))
    assert (m.n_inputs, m.n_labels) == (4, 3) and type(m.n_inputs) is int
    mc = Multiclass(np.int64(3), 2, bias=np.bool_(False))
    assert mc.bias is False and mc.n_features == 6
    assert SparseFeatures(torch.tensor([0, 1]), torch.tensor([0]), None, np.int64(2)).n_features == 2
    assert GraphCut(np.int16(3), pairwise=np.bool_(True)).n_inputs == 3


# ---------------------------------------------------------------------- solver options
@pytest.mark.parametrize("kw, fragment", [
    (dict(gap_check=2.7), "gap_check must be an integer >= 1, got 2.7"),
    (dict(gap_check=3.0), "gap_check must be an integer >= 1, got the float 3.0: write it as 3"),
    (dict(gap_check=True), "gap_check must be an integer >= 1, got True"),
    (dict(gap_check=0), "gap_check must be an integer >= 1, got 0"),
    (dict(averaging="no"), "averaging must be a bool .True or False., got 'no'"),
    (dict(check_averaged=1), "check_averaged must be a bool"),
    (dict(track_train_loss=None), "track_train_loss must be a bool"),
    (dict(progress="yes"), "progress must be a bool"),
    (dict(cache="yes"), "cache must be a bool"),
    (dict(gap_tol=NAN), "gap_tol must be a finite number >= 0 or None, got nan"),
    (dict(gap_tol=True), "gap_tol must be a finite number"),
    (dict(rel_gap_tol=NAN), "rel_gap_tol must be a finite number >= 0 or None, got nan"),
    (dict(time_budget=NAN), "time_budget must be a finite number > 0 or None, got nan"),
    (dict(time_budget=INF), "time_budget must be a finite number > 0 or None, got inf"),
    (dict(max_passes=NAN), "max_passes must be a finite number > 0, got nan"),
    (dict(max_passes=INF), "max_passes must be a finite number > 0, got inf"),
    (dict(max_passes=True), "max_passes must be a finite number > 0, got True"),
    (dict(max_passes="10"), "max_passes must be a finite number > 0, got '10'"),
    (dict(seed=True), "seed must be an integer >= 0, got True"),
    (dict(seed=1.0), "seed must be an integer >= 0, got the float 1.0: write it as 1"),
    (dict(seed=-1), "seed must be an integer >= 0, got -1"),
    (dict(cache_size=10.0), "cache_size must be an integer >= 1, got the float 10.0: write it as 10"),
    (dict(cache_size=False), "cache_size must be an integer >= 1, got False"),
    (dict(mp_inactive_iters=2.0), "mp_inactive_iters must be an integer >= 0, got the float 2.0: write it as 2"),
    (dict(mp_max_planes=True), "mp_max_planes must be an integer >= 0, got True"),
    (dict(gap_power=NAN), "gap_power must be a finite number > 0, got nan"),
    (dict(gap_power=INF), "gap_power must be a finite number > 0, got inf"),
    (dict(cache_F=True), "cache_F must be a number > 0"),
    (dict(cache_nu=NAN), "cache_nu must be a number > 0"),
    (dict(early_gap_check=NAN), "early_gap_check must be a finite number > 0"),
    (dict(mp_approx_ratio=NAN), "mp_approx_ratio must be a number >= 0"),
    (dict(mp_clock="fast"), "mp_clock must be one of"),
])
def test_bad_solver_options_raise(kw, fragment):
    # a solver's own options are checked by its option group (beside the solver)
    group = next((cls.Options for cls in ALGORITHMS.values() if cls.Options and set(kw) <= set(cls.Options.flat_names())),
                 None)
    with pytest.raises(ValueError, match=fragment):
        group.from_flat(kw) if group is not None else SolverOptions(**kw)
    with pytest.raises(ValueError, match=fragment):
        options_for(next((name for name, cls in ALGORITHMS.items() if cls.Options is group), "bcfw"), **kw)


def test_good_solver_options_are_kept():
    o = options_for("bcfw", gap_check=np.int64(3), averaging=np.bool_(False), seed=np.int32(5), cache_size=np.int64(7),
                    max_passes=np.float64(2.5), gap_tol=0, time_budget=3, cache_nu=INF)
    mp = MPOptions(approx_ratio=INF)
    assert (o.gap_check, o.averaging, o.seed, o.own.cache_size) == (3, False, 5, 7)
    assert type(o.gap_check) is int and type(o.averaging) is bool and type(o.seed) is int
    assert o.max_passes == 2.5 and mp.approx_ratio == INF and mp.clock == "auto"


# ---------------------------------------------------------------------- presets never override given fields
@pytest.mark.parametrize("kw, fragment", [
    (dict(preset="gap-fw", sampling="uniform"), "preset 'gap-fw' sets sampling='gap' but sampling='uniform' was given"),
    (dict(preset="gap-pairwise-cache", cache=False), "preset 'gap-pairwise-cache' sets cache=True but cache=False"),
    (dict(preset="uniform-fw", step_rule="away"), "sets step_rule='fw' but step_rule='away'"),
    (dict(preset="pairwise", sampling="perm"), "sets sampling='uniform' but sampling='perm'"),
    (dict(preset="auto", sampling="perm"), "preset='auto' chooses among"),
    (dict(preset="auto", step_rule="away"), "preset='auto' chooses among"),
    (dict(preset="auto", sampling="uniform", step_rule="pairwise"), "sampling='uniform', step_rule='pairwise' fits none"),
    (dict(preset="auto", cache=True, step="fixed"), "with step='fixed'"),
])
def test_preset_conflicting_with_a_given_field_raises(kw, fragment):
    with pytest.raises(ValueError, match=fragment):
        options_for("bcfw", **kw)
    model, data = random_multiclass_problem(n=6)
    with pytest.raises(ValueError, match=fragment):
        fit(model, data, 0.1, max_passes=1, **kw)


@pytest.mark.parametrize("preset", [p for p in PRESETS if p != "auto"])
def test_preset_with_the_same_values_and_the_to_dict_reload_work(preset):
    o = options_for("bcfw", preset=preset)
    same = options_for("bcfw", preset=preset, sampling=o.sampling, step_rule=o.own.step_rule, cache=o.own.cache)
    assert same.to_dict() == o.to_dict()
    assert options_for("bcfw", **o.to_dict()).to_dict() == o.to_dict()
    assert variant_name(options_for("bcfw", **o.to_dict())) == preset


def test_preset_auto_is_pinned_by_given_fields_and_reloads():
    model, data = random_multiclass_problem(n=10, F=3, K=3, seed=0)
    pending = options_for("bcfw", preset="auto")
    assert auto_pending(pending) and pending.sampling is None and variant_name(pending) == "auto"
    assert auto_pending(options_for("bcfw", **pending.to_dict()))  # the reload of an unresolved "auto" stays so
    # the multiclass oracle is cheap (auto would choose plain BCFW), but cache=True was given: it is kept
    r = fit(model, data, 0.1, preset="auto", cache=True, max_passes=1)
    assert variant_name(r.options) == "gap-pairwise-cache" and "auto" not in r.options.extra
    cheap = fit(model, data, 0.1, preset="auto", max_passes=1)
    assert variant_name(cheap.options) == "uniform-fw" and cheap.options.extra["auto"]["chosen"] == "uniform-fw"
    assert variant_name(options_for("bcfw", **cheap.options.to_dict())) == "uniform-fw"  # resolved: stays resolved
    fixed = options_for("bcfw", preset="auto", step="fixed")  # FW steps without the cache, gap or uniform sampling
    assert auto_pending(fixed) and auto_fits(fixed) == ["gap-fw", "uniform-fw"]
    assert variant_name(options_for("bcfw", preset="auto", cache=True)) == "gap-pairwise-cache" == AUTO_CHOICES[0]
    pairwise = options_for("bcfw", preset="auto", sampling="gap", step_rule="pairwise")  # with or without the cache
    assert auto_pending(pairwise) and auto_fits(pairwise) == ["gap-pairwise-cache", "gap-pairwise"]
    assert pairwise.sampling == "gap" and pairwise.own.step_rule == "pairwise" and pairwise.own.cache is None
    assert variant_name(fit(model, data, 0.1, preset="auto", step_rule="pairwise", max_passes=1).options) == \
        "gap-pairwise"  # a cheap multiclass oracle: no cache


# ---------------------------------------------------------------------- feature tensors
def _complex(shape):
    return torch.randn(*shape, dtype=torch.complex128)


@pytest.mark.parametrize("build, fragment", [
    (lambda: MulticlassData(_complex((4, 3)), torch.zeros(4, dtype=torch.long)), "MulticlassData.x must be real"),
    (lambda: MulticlassData(torch.randn(4, 3), _complex((4,))), "MulticlassData.y must hold integer labels"),
    (lambda: _seq(torch.tensor([0, 2, 5]), _complex((5, 2))), "SequenceData.x must be real"),
    (lambda: SequenceData.from_sequences([_complex((2, 3))], [torch.zeros(2, dtype=torch.long)]), "SequenceData.x must be real"),
    (lambda: SequenceData(torch.randn(5, 2), _complex((5,)), torch.tensor([0, 5])), "SequenceData.y must hold integer"),
    (lambda: SparseFeatures(torch.tensor([0, 1]), torch.tensor([0]), _complex((1,)), 2), "SparseFeatures.values must be real"),
    (lambda: _graph(x=_complex((4, 2))), "GraphData.x must be real"),
    (lambda: _graph(edge_x=_complex((3, 1))), "GraphData.edge_x must be real"),
    (lambda: _graph(y=torch.tensor([0, 1, 1, 0], dtype=torch.complex64)), "GraphData.y must hold integer labels"),
    (lambda: _graph().with_features(_complex((4, 2))), "GraphData.x must be real"),
    (lambda: _pose(_complex((2, 3, 4, 4))), "PoseData.unary must be real"),
    (lambda: _pose(torso=_complex((2,))), "PoseData.torso must be real"),
])
def test_complex_features_are_rejected(build, fragment):
    with pytest.raises(ValueError, match=fragment):
        build()


def _grad(shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("build, fragment", [
    (lambda: MulticlassData(_grad((4, 3)), torch.zeros(4, dtype=torch.long)), "MulticlassData.x requires grad"),
    (lambda: _seq(torch.tensor([0, 2, 5]), _grad((5, 2))), "SequenceData.x requires grad"),
    (lambda: SequenceData.from_sequences([_grad((2, 3)) * 2], [torch.zeros(2, dtype=torch.long)]), "SequenceData.x requires grad"),
    (lambda: SequenceData.from_padded(_grad((2, 3, 4)), torch.tensor([3, 2])), "SequenceData.x requires grad"),
    (lambda: _graph(x=_grad((4, 2))), "GraphData.x requires grad"),
    (lambda: _graph().with_features(_grad((4, 2))), "GraphData.x requires grad"),
    (lambda: _pose(_grad((2, 3, 4, 4))), "PoseData.unary requires grad"),
])
def test_features_that_require_grad_are_rejected(build, fragment):
    with pytest.raises(ValueError, match=fragment + r".*\.detach\(\)"):
        build()


def test_detached_features_work():
    x = _grad((4, 3))
    data = MulticlassData(x.detach(), torch.tensor([0, 1, 0, 1]))
    assert not data.x.requires_grad
    with torch.no_grad():
        assert not MulticlassData(x * 2, torch.tensor([0, 1, 0, 1])).x.requires_grad


@pytest.mark.parametrize("build, fragment", [
    (lambda: MulticlassData(torch.zeros(4, 3, device="meta"), torch.zeros(4, dtype=torch.long, device="meta")),
     "MulticlassData.x is on the meta device"),
    (lambda: SequenceData(torch.zeros(5, 2, device="meta"), None, torch.tensor([0, 5])), "SequenceData.x is on the meta device"),
    (lambda: SequenceData(torch.zeros(5, 2), None, torch.tensor([0, 5], device="meta")),
     "SequenceData.offsets is on the meta device"),
    (lambda: SparseFeatures(torch.tensor([0, 1]), torch.tensor([0]), torch.ones(1, device="meta"), 2),
     "SparseFeatures.values is on the meta device"),
    (lambda: _graph(x=torch.zeros(4, 2, dtype=torch.float64, device="meta")), "GraphData.x is on the meta device"),
    (lambda: _graph(edges=torch.zeros(3, 2, dtype=torch.long, device="meta")), "GraphData.edges is on the meta device"),
    (lambda: _pose(torch.zeros(2, 3, 4, 4, device="meta")), "PoseData.unary is on the meta device"),
])
def test_meta_device_data_is_rejected(build, fragment):
    with pytest.raises(ValueError, match=fragment):
        build()


# ---------------------------------------------------------------------- lam
@pytest.mark.parametrize("lam, exc, fragment", [
    (True, TypeError, "lam must be a real number > 0, got True"),
    (np.bool_(True), TypeError, "lam must be a real number > 0"),
    ("0.1", TypeError, "lam must be a real number > 0, got '0.1'"),
    (0.1 + 0j, TypeError, "lam must be a real number > 0"),
    (torch.tensor([0.1]), TypeError, "lam must be a real number > 0"),
    (None, TypeError, "lam must be a real number > 0, got None"),
    (NAN, ValueError, "lam must be a finite number > 0, got nan"),
    (INF, ValueError, "lam must be a finite number > 0, got inf"),
    (0, ValueError, "lam must be a finite number > 0, got 0.0"),
    (-1.0, ValueError, "lam must be a finite number > 0"),
])
def test_bad_lam(lam, exc, fragment):
    with pytest.raises(exc, match=fragment):
        check_lam(lam)
    model, data = random_multiclass_problem(n=4)
    with pytest.raises(exc, match=fragment):
        fit(model, data, lam, max_passes=1)


@pytest.mark.parametrize("lam", [0.1, 1, np.float64(0.1), np.float32(0.5), np.int64(2), torch.tensor(0.1)])
def test_good_lam(lam):
    v = check_lam(lam)
    assert type(v) is float and v == pytest.approx(float(lam))
