CREATE DATABASE dssm_prefect;
