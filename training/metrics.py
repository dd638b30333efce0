"""What a run reports: the lab's success threshold, the stop exit code, throughput and the final metrics."""

SUCCESS_LOSS = 7.0  # the lab's goal: a training loss below 7 (report/make_report.py draws this line)
STOP_EXIT_CODE = 3  # "checkpointed on a signal, resume me" (slurm/gpt.sh requeues on it)
