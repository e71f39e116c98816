"""How long a test waits for something that must happen: a hang guard, never a speed check.

A test that gives a subprocess, a thread or a condition 10-120 s fails on a loaded machine (five
developers share two cores here; a Python start that imports torch took over 60 s at load 50)
while the code under test is right. So every such wait uses this one bound, which only turns a
hang into a failure before pytest-timeout's 600 s would (pyproject.toml) and says what it waited
for. Timing guarantees of the product (a storage call's deadline) are tested where they are
documented, against those deadlines, not here.
"""

HANG_GUARD_S = 540.0
