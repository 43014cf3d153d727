"""The engine under every pipeline: the machine and each pass's floor (`machine`, `floor`), precisions (`precision`,
`int8`), compiled steps (`compiled`) and what a pass costs by width (`pass_costs`, which adaptive drafting reads).
Methods save passes; the engine makes each remaining pass cost what it must. It sits between the core (which it
may import) and the domains (which import it)."""
