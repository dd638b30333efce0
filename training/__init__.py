"""The machinery behind gpt_train.py, one module per concern; gpt_train.py keeps the model and the loop.

    signals.py      the stop flag: USR1/TERM/Ctrl-C caught from the first import, before torch loads
    device.py       precision, TF32, compile decisions; the peak-FLOP table and MFU
    budget.py       the token budget in whole micro-batches; the micro-batch plan, probe and agreement
    checkpoints.py  the typed training state; save / verify / latest; run identity; the run directory
    metrics.py      throughput, final metrics, the start-up and summary lines, SUCCESS_LOSS
"""
