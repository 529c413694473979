"""Past one host: the same launch on every host of a Ray cluster (a TPU pod slice).

`notebook_launcher(..., cluster=..., hosts=N)` lands here (docs/pods.md). Nothing in this
package is imported by a launch on one host, and only its modules import `ray`, on first use.
"""
