"""Judge: metrics of a value pair, tolerances by dtype, and the pass / warning / error verdict."""
