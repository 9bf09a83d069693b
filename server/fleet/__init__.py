"""The engine's side of a fleet on NVIDIA Dynamo: its membership (the worker), the DeploymentCard it
publishes, and the runtime both fleet processes join."""
