"""The RL core of Ape-X, with no Ray, OpenTelemetry or cloud code: its settings (config), the
dueling Q-network (network), prioritized replay (replay), the epsilon-greedy actor (actor) and
the n-step double-DQN learner (learner). Every notebook builds on it; notebook 01 explains it."""
