"""Prefix pre-warms sent to the model servers (the scheduler plans them: epp.scheduling.prewarm).

`sender.Sender` posts each as a one-token completion of the prompt's first token ids."""
