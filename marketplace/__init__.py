"""The marketplace server: Django + DRF + Celery; jobs, nodes, rounds, verification, money."""
