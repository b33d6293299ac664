"""The outbox-relay benchmark harness (issue 5), a package run by bench/harness.py, which
bench/run calls. Its modules:

  cli            the command line (parse_args) and main
  runner         Harness: the run's shared state, its order of phases and its clean-up
  common         paths, log(), BenchError
  processes      CPU and memory from /proc, a process's sockets and their peers, free ports
  postgres       Psql, LSNs, the benchmark's table, slots, backlogs and pgbench
  prometheus     the contenders' /metrics: scraping, histograms, percentiles
  kafka          the broker: its pid, the run's topics, its warm-up
  visibility     kcat readers: the live commit -> visible consumer, a topic's records
  contenders     the contenders' names, which run, starting and stopping them
  phase_micro    phase micro: bench_micro
  phase_drain    phase drain: the same WAL backlog read by every contender
  phase_live     phase live: fixed insert rates, latency and CPU per rate
  report         the targets, summary.txt, result.json, db-cost.json, plot.png

Harness is one object made of the mixins of postgres, kafka, contenders, the phases and report:
they share its attributes (set in runner.Harness.__init__, except `postmaster`, set by
setup_database) and call each other's methods through `self`.
"""
