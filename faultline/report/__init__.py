"""The nightly fleet report, one job per module:

data      the warehouse reads of a report window
trends    trend tables and views over verdicts (pure Polars)
actions   the drain/reset list and the failure rate with its denominator
compare   the last 24 h against the previous 7 days (rates, change, significance)
colors    outcome colours fixed by the taxonomy
charts    inline SVG charts
html      the self-contained HTML page
artifact  the Prefect markdown artifact
build     end to end: read, write trend tables back, write the page, return the artifact
"""
