"""The report: the evaluation matrix run in simulation, written as markdown with figures."""
