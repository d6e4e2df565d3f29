"""sm120patch's data: recipes (patches/<package>/*.toml), their diffs, and the kernel and
crash-signature catalogues. Nothing here is code; this file only makes the folder a package
so importlib.resources finds it in every install mode (wheel, editable, source checkout)."""
