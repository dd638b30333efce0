"""The report builder, make_report.py: inputs.py and gpu.py read runs, results and GPU folders; facts.py fills
report.md's placeholders; figures.py draws figures and tables; browser.py drives TensorBoard and Chromium."""
