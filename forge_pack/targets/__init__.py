"""What forge-pack knows about each target kind: its ABI, call binders, references and inputs."""
