# The notebook server's image (deploy/notebook.yaml): the jobs' image (deploy/Dockerfile)
# and the wheel's `notebook` extra, JupyterLab (for which the wheel carries our
# extension), ipykernel and scikit-learn (the examples' data). Built FROM the jobs' image,
# it shares all of its layers: a node that runs both pulls only what this adds (317 MiB),
# and job pods do not carry JupyterLab.
#
#   docker build -f deploy/notebook.Dockerfile --build-arg JOB_IMAGE=elasticdl-nb:0.1.0 \
#       -t elasticdl-nb-notebook:0.1.0 .        # the same dist/ wheel as the jobs' image
ARG JOB_IMAGE=elasticdl-nb:0.1.0
FROM ${JOB_IMAGE}

USER root
COPY dist/elasticdl_nb-*.whl /tmp/dist/
# The wheel is the one installed already: pip adds only its extra's packages.
RUN set -- /tmp/dist/elasticdl_nb-*.whl && pip install "$1[notebook]" && rm -rf /tmp/dist

USER 1000
WORKDIR /home/elasticdl
EXPOSE 8888
CMD ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser"]
