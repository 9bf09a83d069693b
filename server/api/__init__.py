"""The REST API's routes (sessions, jobs, trainer, workflows, WHEP, deployment, system) and the
dependencies they share."""
