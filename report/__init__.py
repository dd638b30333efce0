"""The report builder (make_report.py): inputs.py and gpu.py read the runs, results and GPU folders; facts.py fills
report.md's placeholders; tables.py and figures.py draw; browser.py drives TensorBoard and Chromium; outputs.py
writes --out whole or not at all."""
