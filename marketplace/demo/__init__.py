"""`gpuflex demo`: the whole system on one machine, as separate processes: the marketplace
(web server and Celery worker), five contributor agents and a buyer's job."""
