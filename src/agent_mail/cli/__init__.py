"""The command line: words -> values, the call carried out here or by the front end that owns it, JSON out."""
