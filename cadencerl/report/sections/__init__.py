"""The report's twelve sections, in order: each takes the `Report` context and returns its markdown."""

from cadencerl.report.sections.ablation import ablation
from cadencerl.report.sections.bound import physical_bound
from cadencerl.report.sections.composability import composability
from cadencerl.report.sections.cost import cost
from cadencerl.report.sections.misa import misa_t
from cadencerl.report.sections.pools import heterogeneous, homogeneous
from cadencerl.report.sections.residency import non_resident
from cadencerl.report.sections.sensitivity import sensitivity
from cadencerl.report.sections.simulator_change import simulator_change
from cadencerl.report.sections.specialization import specialization
from cadencerl.report.sections.trace import kv_share_trace

EXPERIMENTS = (homogeneous, heterogeneous, composability, specialization, kv_share_trace, sensitivity, non_resident,
               physical_bound, cost, misa_t, ablation, simulator_change)
