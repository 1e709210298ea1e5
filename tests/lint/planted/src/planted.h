// A planted line the history check must reject (tests/CMakeLists.txt, lint.history_planted):
// measured at 3c5bfa2 on 2026-12-01.
