"""The drain drivers: what "drain the node" and "resume it" mean for each scheduler, one
module per ``drain.mode`` (``command``: exec, ``slurm``, ``kubernetes``) plus the recording
driver of simulate (``record``), the shared contract in ``base`` and the list in
``registry``."""
