"""vLLM beside dmacoll: a model folder (model), `vllm bench` runs with the plugin off and on (runs, entry), their
results (results), the output check (check), the plugin's routing table from the measured sweeps (routes) and the
`dmacoll vllm ...` commands (cli). The plugin that vLLM loads is the library's: dmacoll.integrations.vllm."""
