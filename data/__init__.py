"""Data pipelines shared by the scripts (the data sets themselves are git-ignored)."""
