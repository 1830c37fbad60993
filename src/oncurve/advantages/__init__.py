"""Where advantages come from: group statistics (GRPO, RLOO) or a learned critic (PPO, GAE)."""
