"""The mini task set's repositories are data, not swerl's tests: never collect them."""

collect_ignore_glob = ["repos/*", "repo_history/*", "instances/*"]
