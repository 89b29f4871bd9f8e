"""Routing for a cluster of rcllm instances: instance views, policies and the TTFT cost model.

No torch here (a layering test checks): the same objects run inside the simulator
(`rcllm.sim`) and the real router.
"""

from .cost import METHODS, CostModel, MethodConfig, RequestShape, Work
from .policies import RoutingPolicy
from .registry import POLICIES, REGISTRY, method_policy, routing_policy
from .profiles import MODELS, ModelSpec, SpeedProfile, cpu_smollm2_profile, gpu_profile
from .views import ArrayLocality, ClusterView, InstanceView, RoutingRequest, SetLocality

__all__ = ["METHODS", "CostModel", "MethodConfig", "RequestShape", "Work", "POLICIES",
           "REGISTRY", "method_policy", "RoutingPolicy", "routing_policy", "MODELS",
           "ModelSpec", "SpeedProfile", "cpu_smollm2_profile", "gpu_profile", "ArrayLocality", "ClusterView", "InstanceView",
           "RoutingRequest", "SetLocality"]
