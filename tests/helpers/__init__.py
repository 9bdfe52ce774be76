"""Non-test modules the tests share: the harness, fakes, clusters, waits."""
