"""`make bench`: sm120patch measured on real trees, as ratios to floors run alongside."""
