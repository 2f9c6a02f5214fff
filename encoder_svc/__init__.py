"""encoder_svc"""
