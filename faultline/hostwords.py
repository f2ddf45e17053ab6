"""Words that mean a host in a name (logparse's node patterns and the node hints of file names). Here,
without Polars, so the native read of a file (collectors/files.py) can start before Polars is imported."""

HOST_WORD_LONG = r"(?:node|host|gpu|worker|compute|dgx|hgx|srv|server|hpc|a100|h100|h200|b200|gb200|trn|p4d|p5)"
HOST_WORD_SHORT = r"(?:cn|nid|ip|n)"  # too short to mean a host unless a digit follows
