"""Load generation against the served face and the served sweep (`rcllm bench serve`).

It sits above `rcllm.serve`, as a client does: an open-loop HTTP load generator (`client`),
the request trace of a dataset's reviews (`trace`), the load phases with faults and a soak
(`phases`), and the rate sweep over methods and routing policies (`sweep`: its `series`, the
numbers of a cell `cells`, the targets' verdict `targets`). Measurement code below it
(`rcllm.bench`) never imports the serving face.
"""
