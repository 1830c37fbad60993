"""The loop: each step collects scored groups, computes the reference and advantages, updates
the policy and logs; the preflight before step 1, evaluation, the progress bar."""
