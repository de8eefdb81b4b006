"""The config file as a whole: ``loader`` assembles the ``Config`` from every owner's
section reader (it sits above the stages, whose kinds own their readers), and ``stages``
cuts each stage's own sections out of it for the composition root."""
