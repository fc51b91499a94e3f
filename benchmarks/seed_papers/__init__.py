"""The figures of Shah et al. 2015 and Osokin et al. 2016 (``shah2015``, ``osokin2016``) and the problems they share
(``problems``), run through ``benchmarks/seed_figures.py --figure NAME`` (results: ``docs/results/papers.md``)."""
