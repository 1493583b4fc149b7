# The jobsched service image: `docker run jobsched:local gateway|scheduler|worker`, configured
# through JOBSCHED_* environment variables only.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin jobsched \
    && mkdir -p /data \
    && chown jobsched:jobsched /data

WORKDIR /src
COPY pyproject.toml README.md ./
COPY core ./core
COPY store ./store
COPY bus ./bus
COPY actors ./actors
COPY gateway ./gateway
COPY jobsched ./jobsched
RUN pip install . && rm -rf /src

WORKDIR /data
USER jobsched
ENV JOBSCHED_DATA_DIR=/data \
    JOBSCHED_HTTP_HOST=0.0.0.0
EXPOSE 8080
ENTRYPOINT ["jobsched"]
CMD ["--help"]
