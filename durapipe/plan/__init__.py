"""The executor-neutral rules of a stage: its budgets and the one retry state machine.

``dsl -> plan -> {compiler (Argo), runner (local)}``: this package reads the validated model
(``durapipe.dsl``) and the runtime's contract (verdict names) and nothing else.  ``machine``
says what happens after each attempt (``step``); ``graph`` enumerates the states a stage can
reach, which the Argo lowering unrolls into its task grid and the editor counts.
"""
