"""One piece of the package at a time, in this process: the JSON writer, the wire protocol, the calls' checks,
the usage text, the import layers and private names (architecture), lint, how work grows with size."""
