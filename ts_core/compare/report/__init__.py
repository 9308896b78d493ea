"""Report: what a comparison writes and reads back (compare.csv, summary.json, report.html, text, merge)."""
