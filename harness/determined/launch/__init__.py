"""determined.launch: Determined's launchers, the commands an entrypoint starts a trial's
script with:

    entrypoint: python3 -m determined.launch.tensorflow -- python3 train.py
    entrypoint: python3 -m determined.launch.horovod --trial model_def:MyTrial

Under localdet the daemon reads such an entrypoint itself (localdet/config/experiment.py)
and starts the script once per slot where the trial's engine has one process per slot,
giving each rank what the launcher gave it (TF_CONFIG, or Horovod's variables). Run by hand,
outside localdet, these modules start the script as Determined's did off-cluster: once,
unchanged.
"""
