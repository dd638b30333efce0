"""The report builder, a package so its modules import each other by name (`from report import browser`).

    make_report.py   the command: which inputs, the sections of results.md, the build into --out
    inputs.py        run folders, event files and results JSON, read without trusting them
    gpu.py           GPU results folders: each GPU question answered by the first folder that can
    tables.py        the Markdown tables of each kind of JSON, and the two the report's text shows
    figures.py       the matplotlib figures
    facts.py         the {{placeholders}} of report.md and the facts derived for them (runs shown, clocks)
    screenshots.py   TensorBoard pages photographed by Chromium and cropped to their cards
    browser.py       the TensorBoard server, Chromium, the PDF
"""
