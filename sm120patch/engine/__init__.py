"""Writing plans through the journal: one tree, several targets in one transaction, pip's changes, git, preflight."""
