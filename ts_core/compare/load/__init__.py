"""Load: find and read dumps (tsprobe or msprobe), msprobe backward records in tsprobe order."""
