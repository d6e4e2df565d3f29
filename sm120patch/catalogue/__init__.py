"""The data under patches/: recipes, the kernel catalogue, and the strict checks every data file passes."""
