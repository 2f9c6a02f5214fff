"""iris"""
