"""From a path to a plan: find the tree, locate each edit, compute the exact change (and cache the answer)."""
