"""The RL core of Ape-X, with no Ray, OpenTelemetry or cloud code: its settings (config), the
dueling Q-network (network), image frames stored once (frames), prioritized replay (replay),
the environments (envs), the epsilon-greedy actor with n-step folding (actor), the n-step
double-DQN learner (learner), its checkpoints (checkpoints) and TensorFlow's process set-up
(tf_runtime). Every notebook builds on it; notebook 01 explains it. docs/development.md says
which file to change for what."""
