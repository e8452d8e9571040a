"""GPU faults: a fatal GPU event drains the GPU and flags the pools on it (`services`); who is told and in
what words (`audience`); the approvers' and operators' faults page and the tenant's banner (`views`, `urls`).
"""
