"""The report builder, a package so its modules import each other by name (`from report import browser`).

    make_report.py   the command: which inputs, the sections of results.md, the build into --out
    inputs.py        run folders, event files and results JSON, read without trusting them
    gpu.py           a GPU results folder: its files, the slots the report links, its committed events
    tables.py        the Markdown tables of each kind of JSON
    figures.py       the matplotlib figures
    facts.py         the {{placeholders}} of report.md, filled from the same inputs
    screenshots.py   TensorBoard pages photographed by Chromium and cropped to their cards
    browser.py       the TensorBoard server, Chromium, the PDF
"""
