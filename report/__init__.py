"""The report builder (make_report.py, which also writes --out whole or not at all): inputs.py and gpu.py read the
runs, results and GPU folders; facts.py fills report.md's placeholders; figures.py draws the figures and tables;
browser.py drives TensorBoard and Chromium."""
