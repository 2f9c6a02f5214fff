"""llm_svc"""
