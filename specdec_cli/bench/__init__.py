"""`specdec bench`: prompt files, configurations, the run, the report."""
