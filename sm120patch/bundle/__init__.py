"""Bundles: a plan's kept recipes as git patches plus a manifest; export, strict reading, applying on a node."""
