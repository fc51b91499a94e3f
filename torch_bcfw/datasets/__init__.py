"""Dataset loaders. Each takes an explicit path and says where it looked when the data is missing."""
