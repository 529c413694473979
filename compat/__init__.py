"""`make compat`: the table of transformers' architectures (docs/compatibility.md)."""
