"""Package data: scenes (MJCF), task definitions, samplers and skills; and the script that rebuilds
the skills."""
