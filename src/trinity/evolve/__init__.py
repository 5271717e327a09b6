"""Training the head: sep-CMA-ES over memoised rollout trees."""
